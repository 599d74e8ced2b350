"""Many requests at once: a fixed batch (batch.py), the continuous-batching scheduler and its key/value slots, the
work after each forward pass that both share (step.py: the token pick, a row's text, a row's failure), and the
prefix cache shared by requests that begin alike."""
