import sys

from benchmarks.scale.run import main

sys.exit(main())
