"""``python -m tensorfuse``: the command line (``tensorfuse --help``)."""
from tensorfuse.compiler.cli import main

raise SystemExit(main())
