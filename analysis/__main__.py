"""``python -m analysis fit RESULTS_DIR`` (the same as ``attnres fit``)."""

import sys

from analysis.cli import main

sys.exit(main())
