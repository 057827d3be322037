"""A probe that crashes with a message on stderr."""

import sys

print("loading the model...", file=sys.stderr)
raise RuntimeError("probe exploded on purpose")
