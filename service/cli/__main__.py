"""``python -m service.cli``."""

from service.cli import main

raise SystemExit(main())
