package main

import (
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/agent"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// TestAgentConfigFromBootstrapKeepsTheNoticeWatch: the config file the
// bootstrap writes on a spot machine names the metadata server to watch;
// the agent started with it watches that server (it once dropped the
// field, so no burst agent ever read a spot notice).
func TestAgentConfigFromBootstrapKeepsTheNoticeWatch(t *testing.T) {
	raw, err := bootstrap.AgentConfig{Broker: "https://broker:8080", Token: "tok", Name: "spw-1", GPUs: "sim:1xL4-24GB",
		DataDir: "/var/lib/spillway", Notice: &agentapi.NoticeWatch{Provider: "aws", Endpoint: "http://127.0.0.1:1338"}}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var file agent.Config
	if err := broker.DecodeStrict(raw, &file); err != nil {
		t.Fatal(err)
	}
	var c agent.Config
	mergeAgentConfig(&c, file, agentCmd(&globals{}))
	if c.Notice == nil || c.Notice.Provider != "aws" || c.Notice.Endpoint != "http://127.0.0.1:1338" {
		t.Fatalf("notice watch %+v, want aws at http://127.0.0.1:1338", c.Notice)
	}
	if c.Name != "spw-1" || c.DataDir != "/var/lib/spillway" {
		t.Fatalf("config %+v", c)
	}
}
