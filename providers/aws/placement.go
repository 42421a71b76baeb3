package aws

import (
	"context"
	"errors"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/spillway-dev/spillway/providers"
)

var _ providers.Placer = (*Provider)(nil)

// ensurePlacementGroup creates the cluster placement group a gang's
// machines share (one zone, one low-latency network segment); an existing
// group of that name is used as is.
func (p *Provider) ensurePlacementGroup(ctx context.Context, name string) error {
	_, err := p.api.CreatePlacementGroup(ctx, &ec2.CreatePlacementGroupInput{
		GroupName: awssdk.String(name),
		Strategy:  types.PlacementStrategyCluster,
	})
	var ae smithy.APIError
	if err != nil && !(errors.As(err, &ae) && ae.ErrorCode() == "InvalidPlacementGroup.Duplicate") {
		return mapError("create placement group", err)
	}
	return nil
}

// DeletePlacement deletes a placement group once its machines are gone.
func (p *Provider) DeletePlacement(ctx context.Context, name string) error {
	_, err := p.api.DeletePlacementGroup(ctx, &ec2.DeletePlacementGroupInput{GroupName: awssdk.String(name)})
	var ae smithy.APIError
	if err != nil && !(errors.As(err, &ae) && ae.ErrorCode() == "InvalidPlacementGroup.Unknown") {
		return mapError("delete placement group", err)
	}
	return nil
}
