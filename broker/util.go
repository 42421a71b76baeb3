package broker

import "slices"

func sortedMapKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedQueueNames(m map[string]QueueLimits) []string { return sortedMapKeys(m) }
