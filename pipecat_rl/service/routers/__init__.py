"""One router per resource: jobs, adapters, receipts, the live pointer."""
