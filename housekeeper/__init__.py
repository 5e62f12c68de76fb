"""The housekeeper (`inferq webhooks`, no GPU) and `inferq beat`: webhook delivery, maintenance
(republishing lost work, expiring and finalizing batches) and retention."""
