"""The multi-host suite's helpers (netns_hosts, gateway_cluster) are imported by name."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
