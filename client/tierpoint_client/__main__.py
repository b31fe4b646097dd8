import sys

from tierpoint_client.cli import main

sys.exit(main())
