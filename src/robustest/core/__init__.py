"""Runtime pieces every layer uses, one module per idea: errors, validation (the checks every value goes through
and the argparse types built from them), devices, seeding, the one model call and its modes, input checks,
batching over any data source, sharding (torch.distributed), atomic writes, bounded reading, progress bars,
resumable steps, mixed precision and the batch-size probe. Import names from their module
(``from robustest.core.batching import iter_batches``); this package re-exports nothing."""
