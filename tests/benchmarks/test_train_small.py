"""benchmarks/train_small.py --repeats: a row that is a span of the text, a blank line, then the same span."""

import numpy as np


def test_a_repeated_row_is_a_span_a_blank_line_and_the_span_again_filled_to_the_context():
    import train_small

    ids, blank = np.arange(1000, 2000), np.array([628, 628])
    row = train_small.repeated_row(ids, 100, 65, blank)
    half = (65 - 2) // 2
    assert len(row) == 65
    assert list(row[:half]) == list(ids[100 : 100 + half]) == list(row[half + 2 : 2 * half + 2])
    assert list(row[half : half + 2]) == [628, 628]
    assert list(row[2 * half + 2 :]) == list(ids[100 + half : 100 + half + 1])  # the text goes on after the copy
