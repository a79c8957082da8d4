package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
)

// registryResolver is dialogue.Resolver over the registry: each direct
// recipient must exist (the directory, cached) and pass
// CheckDialoguePermission. Group addresses wait for the registry's
// distribution-list resolution.
type registryResolver struct {
	c   registryv1.RegistryServiceClient
	dir *directory.Directory
}

func (r registryResolver) Resolve(ctx context.Context, sender string, l dialogue.List) ([]dialogue.Candidate, error) {
	if len(l.Groups) > 0 {
		return nil, status.Error(codes.Unimplemented, "to.groups: group addresses are not resolved yet; name the agents in to.direct")
	}
	out := make([]dialogue.Candidate, 0, len(l.Direct))
	seen := map[string]bool{sender: true}
	for _, a := range l.Direct {
		if seen[a] {
			continue
		}
		seen[a] = true
		c := dialogue.Candidate{Agent: a}
		_, err := r.dir.Agent(ctx, a)
		switch {
		case errors.Is(err, directory.ErrNotFound):
			c.Refused, c.Detail = dialogue.ReasonUnknownAgent, a+" does not exist"
		case err != nil:
			return nil, fmt.Errorf("%w: %w", dialogue.ErrUnavailable, err)
		default:
			p, err := r.c.CheckDialoguePermission(ctx, &registryv1.CheckDialoguePermissionRequest{Sender: sender, Recipient: a})
			if err != nil {
				return nil, fmt.Errorf("%w: %w", dialogue.ErrUnavailable, registryError(err))
			}
			if !p.GetAllowed() {
				c.Refused, c.Detail = dialogue.ReasonPermission, a+" does not follow "+sender+" and shares no client group or open group with it"
			}
		}
		out = append(out, c)
	}
	return out, nil
}
