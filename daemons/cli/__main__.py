"""``python -m daemons.cli``: the ``wsctx`` command."""
import sys

from daemons.cli import main

sys.exit(main())
