"""``python -m ddtk.doctor [--json]``: the doctor on its own."""

import sys

from ddtk.doctor import main

sys.exit(main())
