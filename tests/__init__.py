import os

# The suite tests the Python modules (some tests patch and count their methods, which a
# compiled caller never looks up); tests/simulations/test_native.py compares the compiled
# build with them in processes of its own (which set it to 0).
os.environ.setdefault("EDL_PURE", "1")
