package streams

// PartitionFor is the partition the default producer (franz-go's sticky key
// partitioner, the same hash as Kafka's Java client) picks for a keyed
// record in a topic of n partitions. Processors use it to co-partition data
// they write in batches with a topic keyed per item: a batch of uins keyed
// by one of its uins lands where each of them would have.
func PartitionFor(key []byte, n int) int {
	return int(murmur2(key)&0x7fffffff) % n
}

// murmur2 is MurmurHash2 with Kafka's seed, as the Java client computes it.
func murmur2(data []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	n := len(data)
	h := uint32(seed) ^ uint32(n)
	for ; len(data) >= 4; data = data[4:] {
		k := uint32(data[0]) | uint32(data[1])<<8 | uint32(data[2])<<16 | uint32(data[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(data) {
	case 3:
		h ^= uint32(data[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
