# One image per Parley process, all from this file:
#
#   docker build --build-arg SERVICE=registry -t ghcr.io/parleyhq/parley-registry:dev .
#
# SERVICE is one of registry, negotiator, dispatcher, tasks or gateway. Every
# image holds the chosen program as /service and the parley CLI as /parley,
# which the compose healthchecks run as `/parley health ...`. The gateway image
# is the parley CLI with `gateway` as its default command.
#
# Needs BuildKit (the default builder since Docker 23) for RUN --mount.

# Declared before the first FROM so that the last FROM can pick a stage by it.
ARG SERVICE

FROM golang:1.26.8-bookworm AS build
ARG SERVICE
# VERSION is what `parley version` prints: --build-arg VERSION=v1.2.3.
ARG VERSION=dev
ENV CGO_ENABLED=0 \
    GOTOOLCHAIN=local \
    GOFLAGS=-buildvcs=false
RUN case "${SERVICE}" in \
      registry|negotiator|dispatcher|tasks|gateway) ;; \
      "") echo "Dockerfile: the build arg SERVICE is required, e.g. --build-arg SERVICE=registry (one of registry, negotiator, dispatcher, tasks, gateway)" >&2; exit 1 ;; \
      *) echo "Dockerfile: unknown SERVICE '${SERVICE}': want one of registry, negotiator, dispatcher, tasks, gateway" >&2; exit 1 ;; \
    esac
WORKDIR /src
# The source is bind-mounted rather than copied: go.work ties the modules
# together, and the module and build caches survive between builds.
RUN --mount=type=bind,target=/src \
    --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    set -eu; \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/parley ./cmd/parley; \
    if [ "${SERVICE}" = gateway ]; then \
      cp /out/parley /out/service; \
    else \
      go build -trimpath -ldflags='-s -w' -o /out/service "./services/${SERVICE}/cmd/${SERVICE}"; \
    fi; \
    mkdir -p /out/data

# distroless/static has no shell and no libc, only CA certificates, tzdata and
# the nonroot user (65532).
FROM gcr.io/distroless/static-debian12:nonroot AS runtime
ARG SERVICE
LABEL org.opencontainers.image.title="parley-${SERVICE}" \
      org.opencontainers.image.source="https://github.com/parleyhq/parley"
COPY --from=build /out/service /service
COPY --from=build /out/parley /parley
# A new named volume copies the ownership of its mount point from the image,
# so the data directory must exist and belong to the nonroot user.
COPY --from=build --chown=65532:65532 /out/data /var/lib/parley
# The shared operator token's volume (docker-compose.yml) takes this
# directory's owner, so that the services may write the token there.
COPY --from=build --chown=65532:65532 /out/data /run/parley
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/service"]

# CMD cannot use build args, so the last FROM picks a stage by SERVICE: the
# gateway's default command needs a stage of its own. The services take all
# their settings from PARLEY_* variables (or flags).
FROM runtime AS runtime-registry
FROM runtime AS runtime-negotiator
FROM runtime AS runtime-dispatcher
FROM runtime AS runtime-tasks
FROM runtime AS runtime-gateway
CMD ["gateway"]
# Without SERVICE the build stage stops with the message above. A misspelt
# SERVICE fails sooner, when BuildKit cannot find a stage (or image) called
# runtime-<SERVICE>.
FROM build AS runtime-missing

FROM runtime-${SERVICE:-missing}
