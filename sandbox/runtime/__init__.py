"""What runs inside a sandbox: one long-lived IPython shell answering framed requests.

Everything in this package is copied into the sandbox and runs under the image's own
Python, so it imports the standard library and IPython only (never the host package).
"""
