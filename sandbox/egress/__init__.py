"""Egress on request: a host-side proxy that lets a sandbox reach allow-listed hosts only.

Without a policy a sandbox has no network at all (its namespace holds only loopback and its
seccomp filter only AF_UNIX). With one, the sandbox gets a unix socket to this proxy, a small
forwarder that offers it as HTTP(S)_PROXY on the sandbox's own loopback, and placeholders for
the secrets the proxy puts into requests to their bound hosts.
"""
