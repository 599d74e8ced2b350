"""Many requests at once: a fixed batch (batch.py), the continuous-batching scheduler and its key/value slots, and
the prefix cache shared by requests that begin alike."""
