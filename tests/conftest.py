import os
import sys

# The test models live beside the tests; bench/ imports them too.
sys.path.insert(0, os.path.dirname(__file__))
