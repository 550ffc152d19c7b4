"""What sandboxes use, and what they used: live figures from each sandbox's cgroup and
workspace (``meter``), the records that outlive them in SQLite (``store``), the report an
operator reads (``report``) and the Prometheus metrics a dashboard scrapes (``metrics``)."""
