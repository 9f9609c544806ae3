import sys

from stabledrl_bench.cli import main

sys.exit(main())
