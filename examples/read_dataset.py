"""Read a Megatron indexed dataset with packpipe.

    PYTHONPATH=build/python /usr/bin/python3 examples/read_dataset.py PREFIX
"""
import sys

import packpipe

ds = packpipe.IndexedDataset(sys.argv[1])
print(f"{ds.prefix}: {ds.format}, {len(ds)} sequences, {ds.num_documents} documents, "
      f"{ds.num_tokens} tokens, dtype {ds.dtype}")
print("longest sequence:", int(ds.sizes.max()), "tokens")
first = ds[0]                      # a read-only numpy view into the memory map, no copy
print("sequence 0:", first[:16].tolist(), "..." if len(first) > 16 else "")
