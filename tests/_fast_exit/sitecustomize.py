"""Put on PYTHONPATH for the tests' child processes (tests/conftest.py): at exit they skip the
interpreter's last garbage collections, about 1 s for a process that imported torch, across
the suite's hundreds of training processes. Registered first, so it runs after every other
atexit handler (prudent's, torch's, a tracker's); only garbage in reference cycles is left
unfreed, and an open file, freed by its count, is still flushed and closed."""

import atexit
import gc

atexit.register(gc.freeze)
