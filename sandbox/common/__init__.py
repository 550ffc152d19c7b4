"""What every layer of the service shares: where state lives (paths.py), atomic JSON files
(statefile.py), the one API error (errors.py), sandbox ids (ids.py), the escaped spelling of
file names (filenames.py) and the link-proof directory walk (nofollow.py).

Imports nothing of ``sandbox`` outside this package, so that any layer (the supervisor,
isolation, the client, the kernel) may import it.
"""
