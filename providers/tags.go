package providers

import "strings"

// Tag keys every provider puts on its machines, besides the request's own
// tags. Each backend spells them in its own syntax (EC2 and Lambda tags
// "spillway:cluster", GCE labels "spillway-cluster").
const (
	// TagCluster carries the cluster name; List filters on it.
	TagCluster = "cluster"
	// TagRecord carries the broker's record id; Create's idempotency and
	// the leak sweep rely on it.
	TagRecord = "record"
)

// ReservedTag reports whether a request may not set this tag key itself.
func ReservedTag(k string) bool { return k == TagCluster || k == TagRecord }

// EncodeTags spells the cluster, record and request tags with a backend's
// prefix ("spillway:" or "spillway-").
func EncodeTags(prefix, cluster, record string, tags map[string]string) map[string]string {
	out := make(map[string]string, len(tags)+2)
	for k, v := range tags {
		out[prefix+k] = v
	}
	out[prefix+TagCluster] = cluster
	out[prefix+TagRecord] = record
	return out
}

// DecodeTags reads back what EncodeTags wrote, ignoring keys without the
// prefix: the cluster, the record id and the request's tags.
func DecodeTags(prefix string, raw map[string]string) (cluster, record string, tags map[string]string) {
	tags = map[string]string{}
	for k, v := range raw {
		name, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		switch name {
		case TagCluster:
			cluster = v
		case TagRecord:
			record = v
		default:
			tags[name] = v
		}
	}
	if len(tags) == 0 {
		tags = nil
	}
	return cluster, record, tags
}
