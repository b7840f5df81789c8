package kvevents

import "github.com/prometheus/client_golang/prometheus"

// Mooncake reports these on /kv_events/status only; /metrics carries them
// under its fields' names.
var (
	descBatches  = prometheus.NewDesc("master_kv_events_published_batches_total", "KV event messages (batches) published", nil, nil)
	descEvents   = prometheus.NewDesc("master_kv_events_published_events_total", "KV events published", nil, nil)
	descDropped  = prometheus.NewDesc("master_kv_events_dropped_events_total", "KV events dropped from a full queue (each skips a sequence number)", nil, nil)
	descSkipped  = prometheus.NewDesc("master_kv_events_skipped_unparsed_keys_total", "events whose object key is no decimal or 0x hash", nil, nil)
	descSubDrops = prometheus.NewDesc("master_kv_events_subscriber_dropped_messages_total", "messages dropped for subscribers that fell behind (their queue full)", nil, nil)
	descSubs     = prometheus.NewDesc("master_kv_events_subscribers", "subscribers receiving KV events", nil, nil)
	descQueue    = prometheus.NewDesc("master_kv_events_queue_length", "KV events waiting to be sent", nil, nil)
)

// Describe implements prometheus.Collector.
func (p *Publisher) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBatches, descEvents, descDropped, descSkipped, descSubDrops, descSubs, descQueue} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (p *Publisher) Collect(ch chan<- prometheus.Metric) {
	s := p.Stats()
	c := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	c(descBatches, s.PublishedBatches)
	c(descEvents, s.PublishedEvents)
	c(descDropped, s.DroppedEvents)
	c(descSkipped, s.SkippedUnparsedKeys)
	c(descSubDrops, s.SubscriberDrops)
	ch <- prometheus.MustNewConstMetric(descSubs, prometheus.GaugeValue, float64(s.Subscribers))
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(s.QueueLength))
}
