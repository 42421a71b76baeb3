package config

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

func TestHADefaultsAndStore(t *testing.T) {
	c, err := Parse([]byte("listen: 127.0.0.1:9090\ndataDir: x\nstore: redis-sentinel://s1:26379,s2:26379/mymaster/2?prefix=prod\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.IsRedis() || c.StorePath() != "" {
		t.Fatalf("sentinel URL: IsRedis %v, StorePath %q", c.IsRedis(), c.StorePath())
	}
	if c.HA.LeaseTTL.D() != 10*time.Second || c.HA.RenewInterval.D() != 10*time.Second/3 || c.HA.AgentGrace.D() != 40*time.Second {
		t.Fatalf("ha defaults: %+v", c.HA)
	}
	if !strings.HasSuffix(c.HA.BrokerID, "-9090") || !nameRe.MatchString(c.HA.BrokerID) {
		t.Fatalf("default broker id %q", c.HA.BrokerID)
	}
	if c.HA.PeerURL != "http://127.0.0.1:9090" {
		t.Fatalf("default peer URL %q", c.HA.PeerURL)
	}
	// On every interface the peer URL names the host, so that one file
	// serves every broker behind a shared advertiseURL.
	c, err = Parse([]byte("listen: 0.0.0.0:8080\nadvertiseURL: http://lb.internal:8080\ndataDir: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	if host, _ := os.Hostname(); c.HA.PeerURL != "http://"+host+":8080" {
		t.Fatalf("peer URL on 0.0.0.0: %q", c.HA.PeerURL)
	}
	c, err = Parse([]byte("dataDir: x\nstore: redis://127.0.0.1:6379/0\nha: {brokerID: b1, leaseTTL: 2s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.HA.BrokerID != "b1" || c.HA.RenewInterval.D() != 2*time.Second/3 {
		t.Fatalf("ha: %+v", c.HA)
	}
}

func TestHABadValuesNameField(t *testing.T) {
	cases := map[string]string{
		// A bad Redis URL is broker/redis's to name (broker/adapters'
		// TestAdapterSectionsNameField).
		"dataDir: x\nha: {leaseTTL: 100ms}":                   "ha.leaseTTL",
		"dataDir: x\nha: {leaseTTL: 2s, renewInterval: 1s}":   "ha.renewInterval",
		"dataDir: x\nha: {brokerID: 'a|b'}":                   "ha.brokerID",
		"dataDir: x\nha: {agentGrace: 2h}":                    "ha.agentGrace",
		"dataDir: x\nha: {leaseTTL: 10s, renewInterval: -1s}": "ha.renewInterval",
	}
	for doc, field := range cases {
		_, err := Parse([]byte(doc))
		ve, ok := broker.AsValidation(err)
		if !ok || ve.First().Field != field {
			t.Errorf("%q: got %v, want an error on %s", doc, err, field)
		}
	}
}
