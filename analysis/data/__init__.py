"""From a results tree to the points a fit reads: loading, selecting, envelopes, stalls, throughput."""
