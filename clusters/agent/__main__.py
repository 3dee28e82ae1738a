import sys

from clusters.agent.main import main

sys.exit(main())
