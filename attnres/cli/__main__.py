"""``python -m attnres.cli``: the same as the ``attnres`` command."""

import sys

from attnres.cli import main

sys.exit(main())
