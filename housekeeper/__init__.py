"""The GPU-less worker (`inferq webhooks`) and `inferq beat`: webhook delivery, maintenance
(republishing lost work, expiring and finalizing batches) and retention."""
