"""How close a package's outputs are to a reference's: the figures (measure.py), the text they are measured on
(eval_text.py), and a package measured again by the runtime alone, `edgelm verify --quality` (check.py)."""
