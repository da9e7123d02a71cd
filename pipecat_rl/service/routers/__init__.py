"""One router per resource: jobs, adapters, receipts, the live pointer, sessions (scores in), duels.

Each module is named after its resource's path (`routers/jobs.py` serves `/jobs`), so it shares
a name with the modules behind it: `service/jobs.py` runs the jobs, `ledger/` stores them. A
router validates a request and delegates; what a resource does lives in those modules.
"""
