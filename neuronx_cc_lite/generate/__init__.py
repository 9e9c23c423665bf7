"""Generation with a decoder whose KV cache stays on the device: the decoder's interface (layout.py), the cache
rewrite of a prefill and a decode step (kv_cache.py), the host's sampling (sampling.py), the loop over a prefill and
a decode bundle sharing one device state (generator.py) and its command line (command.py). Importing the package
imports none of them."""
