"""The prompts the Python API tests give the tiny model: a phrase, a longer sentence, code, and the empty prompt."""

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away", "import numpy as np\n", ""]
