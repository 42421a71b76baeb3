package report

import (
	"fmt"
	"strings"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// Verdicts for ends the node's runtime accounts for.
const (
	VerdictImageNotFound = "image_not_found"
	VerdictPullDenied    = "pull_denied"
	VerdictMemoryLimit   = "oom_limit"
	VerdictRuntime       = "runtime_error"
)

// explainRuntime fills the runtime's own account of the end from the
// transition the agent's report made: its reason and message. An OOM kill
// by the job's memory limit replaces the guess from the log.
func explainRuntime(x *api.ExplainExit) {
	detail := x.Detail
	switch x.Reason {
	case agentapi.ReasonImageNotFound, agentapi.ReasonPullDenied, agentapi.ReasonPullFailed, agentapi.ReasonRuntimeError:
		x.Runtime = detail
		x.OOM, x.Evidence = "", ""
	case agentapi.ReasonOOMLimit:
		x.Runtime = runtimeMessage(detail, "OOM-killed by its memory limit")
		x.OOM, x.Evidence = "limit", x.Runtime
	case agentapi.ReasonOOMNode:
		x.Runtime = runtimeMessage(detail, "OOM-killed")
		x.OOM, x.Evidence = "host", x.Runtime
	default:
		if x.ExitCode != nil && !stoppedByBroker(x.Reason) && x.Reason != "" {
			x.Runtime = fmt.Sprintf("exit code %d", *x.ExitCode)
			if x.Signal != "" {
				x.Runtime = "killed by " + x.Signal
			}
		}
	}
}

// runtimeMessage picks the runtime's sentence out of a transition detail
// ("exit code 137: OOM-killed by …; retry 1/3 after 10s").
func runtimeMessage(detail, marker string) string {
	if i := strings.Index(detail, marker); i >= 0 {
		m := detail[i:]
		if k := strings.Index(m, "; retry "); k >= 0 {
			m = m[:k]
		}
		return m
	}
	return detail
}

// runtimeVerdict says what to do about an end the runtime accounts for.
func runtimeVerdict(x *api.Explanation) (api.ExplainVerdict, bool) {
	e := x.Exit
	if e == nil {
		return api.ExplainVerdict{}, false
	}
	j := x.Job
	switch e.Reason {
	case agentapi.ReasonImageNotFound:
		return verdict(VerdictImageNotFound, fmt.Sprintf("The node could not find image %s (%s); check the name and tag, or push the image where the nodes pull from. Nothing was retried.", j.Spec.Image, e.Runtime)), true
	case agentapi.ReasonPullDenied:
		return verdict(VerdictPullDenied, fmt.Sprintf("The registry refused to give the node image %s (%s); an operator must give the nodes credentials for it.", j.Spec.Image, e.Runtime)), true
	case agentapi.ReasonPullFailed, agentapi.ReasonRuntimeError:
		return verdict(VerdictRuntime, fmt.Sprintf("The node's runtime could not run the job: %s.", e.Runtime)), true
	case agentapi.ReasonOOMLimit:
		return verdict(VerdictMemoryLimit, fmt.Sprintf("The job was %s, not by a shortage on the node: raise resources.memory or make it use less.", e.Runtime)), true
	}
	return api.ExplainVerdict{}, false
}
