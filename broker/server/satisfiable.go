package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// CodeUnsatisfiable is the error code of a spec no node and no cloud offer
// could ever run: it would wait forever, so submit refuses it.
const CodeUnsatisfiable = "unsatisfiable"

// unsatisfiableLocked checks a valid spec's GPU model against every card
// model the broker knows (registered nodes, up or down) and, unless the
// job may not burst, every provider's offers. It says nothing while the
// broker knows no node yet (agents register after a restart).
func (s *Server) unsatisfiableLocked(spec broker.Spec) error {
	want := spec.Resources.GPUModel
	if want == "" || s.view.NodeCount() == 0 {
		return nil
	}
	if spec.Burst != broker.BurstNever && len(s.cfg().Providers) > 0 && !s.fleet.OffersKnownLocked() {
		return nil // the offers are not known yet
	}
	var models []string
	add := func(m string) {
		if m != "" && !slices.Contains(models, m) {
			models = append(models, m)
		}
	}
	for n := range s.view.Nodes() {
		for _, d := range n.Inventory.Devices {
			if modelFits(d.Model, want) {
				return nil
			}
			add(gpu.ShortModel(d.Model))
		}
	}
	offered := false
	if spec.Burst != broker.BurstNever {
		for o := range s.fleet.AllOffersLocked() {
			offered = true
			if modelFits(o.GPUModel, want) {
				return nil
			}
			add(o.GPUModel)
		}
	}
	slices.Sort(models)
	where := "no node"
	if spec.Burst != broker.BurstNever && (len(s.cfg().Providers) > 0 || offered) {
		where = "no node and no cloud offer"
	}
	e := newError(http.StatusBadRequest, CodeUnsatisfiable, "%s has gpuModel %s (known: %s); the job would wait forever",
		where, clip(want), strings.Join(models, ", "))
	e.Field = "resources.gpuModel"
	return e
}

// modelFits is the scheduler's rule: "H100" fits "NVIDIA H100 80GB HBM3".
func modelFits(have, want string) bool {
	return strings.Contains(strings.ToLower(have), strings.ToLower(want))
}
