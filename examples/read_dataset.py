"""Read a Megatron indexed dataset with packpipe.

    PYTHONPATH=build/python /usr/bin/python3 examples/read_dataset.py PREFIX
"""
import argparse
import sys

import packpipe

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("prefix", help="the dataset's prefix (PREFIX.idx and PREFIX.bin or PREFIX.bin.zst)")
a = ap.parse_args()
try:
    ds = packpipe.IndexedDataset(a.prefix)
except (ValueError, RuntimeError) as e:
    sys.exit(f"read_dataset: error: {e}")
print(f"{ds.prefix}: {ds.format}, {len(ds)} sequences, {ds.num_documents} documents, "
      f"{ds.num_tokens} tokens, dtype {ds.dtype}")
if len(ds) == 0:
    sys.exit(0)
print("longest sequence:", int(ds.sizes.max()), "tokens")
first = ds[0]                      # a read-only numpy view into the memory map, no copy
print("sequence 0:", first[:16].tolist(), "..." if len(first) > 16 else "")
