package gcp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"

	"github.com/spillway-dev/spillway/providers"
)

// PoliciesAPI is the part of the resource policies client this package
// uses for a gang's compact placement; *compute.ResourcePoliciesClient
// implements it.
type PoliciesAPI interface {
	Insert(ctx context.Context, req *computepb.InsertResourcePolicyRequest, opts ...gax.CallOption) (*compute.Operation, error)
	Delete(ctx context.Context, req *computepb.DeleteResourcePolicyRequest, opts ...gax.CallOption) (*compute.Operation, error)
}

// RegionOperationsAPI is the part of the region operations client this
// package uses; *compute.RegionOperationsClient implements it.
type RegionOperationsAPI interface {
	Wait(ctx context.Context, req *computepb.WaitRegionOperationRequest, opts ...gax.CallOption) (*computepb.Operation, error)
}

var _ providers.Placer = (*Provider)(nil)

// placementClients builds the resource policy and region operation
// clients of New.
func placementClients(ctx context.Context, opts []option.ClientOption) (PoliciesAPI, RegionOperationsAPI, error) {
	pol, err := compute.NewResourcePoliciesRESTClient(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("create resource policies client: %w", err)
	}
	rops, err := compute.NewRegionOperationsRESTClient(ctx, opts...)
	if err != nil {
		pol.Close()
		return nil, nil, fmt.Errorf("create region operations client: %w", err)
	}
	return pol, rops, nil
}

// WithPlacement gives a provider built by NewWithAPI the clients a gang's
// compact placement needs.
func (p *Provider) WithPlacement(pol PoliciesAPI, rops RegionOperationsAPI) *Provider {
	p.pol, p.rops = pol, rops
	return p
}

// zoneRegion is the region of a zone ("us-central1-a" → "us-central1").
func zoneRegion(zone string) string {
	if i := strings.LastIndex(zone, "-"); i > 0 {
		return zone[:i]
	}
	return zone
}

// policyLink is the resource policy's URL relative to the API, as an
// instance's resourcePolicies takes it.
func (p *Provider) policyLink(region, name string) string {
	return fmt.Sprintf("projects/%s/regions/%s/resourcePolicies/%s", p.cfg.Project, region, name)
}

// ensurePlacement creates the compact placement policy a gang's machines
// share (groupPlacementPolicy collocation COLLOCATED: one zone, close
// together on the network) in the zone's region; an existing policy of
// that name is used as is. It returns the policy's link.
func (p *Provider) ensurePlacement(ctx context.Context, zone, name string) (string, error) {
	if p.pol == nil || p.rops == nil {
		return "", providers.NewError(providers.ErrInvalidRequest, providerKind, "create placement policy", "",
			errors.New("this provider was built without a resource policies client"))
	}
	region := zoneRegion(zone)
	op, err := p.pol.Insert(ctx, &computepb.InsertResourcePolicyRequest{Project: p.cfg.Project, Region: region,
		ResourcePolicyResource: &computepb.ResourcePolicy{
			Name:                 ptr(name),
			Description:          ptr("spillway gang placement"),
			GroupPlacementPolicy: &computepb.ResourcePolicyGroupPlacementPolicy{Collocation: ptr("COLLOCATED")},
		}})
	switch {
	case err != nil && googleReason(err) == "alreadyExists":
		return p.policyLink(region, name), nil
	case err != nil:
		return "", mapError("create placement policy", err)
	}
	if err := p.waitRegion(ctx, region, op.Proto(), "create placement policy"); err != nil {
		return "", err
	}
	return p.policyLink(region, name), nil
}

// DeletePlacement deletes a gang's placement policy, in every region of
// the configured zones, once its machines are gone.
func (p *Provider) DeletePlacement(ctx context.Context, name string) error {
	if p.pol == nil || p.rops == nil {
		return nil
	}
	var regions []string
	for _, mt := range p.cfg.MachineTypes {
		for _, z := range mt.Zones {
			if r := zoneRegion(z); !slices.Contains(regions, r) {
				regions = append(regions, r)
			}
		}
	}
	slices.Sort(regions)
	for _, region := range regions {
		op, err := p.pol.Delete(ctx, &computepb.DeleteResourcePolicyRequest{Project: p.cfg.Project, Region: region, ResourcePolicy: name})
		if err != nil {
			if err := mapError("delete placement policy", err); !providers.IsNotFound(err) {
				return err
			}
			continue
		}
		if err := p.waitRegion(ctx, region, op.Proto(), "delete placement policy"); err != nil {
			return err
		}
	}
	return nil
}

// waitRegion blocks on regionOperations.wait until the operation is DONE.
func (p *Provider) waitRegion(ctx context.Context, region string, op *computepb.Operation, what string) error {
	for op.GetStatus() != computepb.Operation_DONE {
		var err error
		op, err = p.rops.Wait(ctx, &computepb.WaitRegionOperationRequest{Project: p.cfg.Project, Region: region, Operation: op.GetName()})
		if err != nil {
			return mapError(what, err)
		}
		if ctx.Err() != nil {
			return providers.NewError(providers.ErrUnavailable, providerKind, what, "", ctx.Err())
		}
	}
	if errs := op.GetError().GetErrors(); len(errs) > 0 {
		fallback := providers.ErrUnavailable
		if c := int(op.GetHttpErrorStatusCode()); c >= 400 && c < 500 {
			fallback = providers.ErrInvalidRequest
		}
		return errorCodes.Map(providerKind, what, errs[0].GetCode(), fallback, errors.New(errs[0].GetMessage()))
	}
	return nil
}
