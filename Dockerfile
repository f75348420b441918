# ratemesh: a static binary on a distroless base, run as non-root.
#   docker build --build-arg VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse HEAD) -t ratemesh .
#
# The default command listens on every interface, so it needs a private
# network key and API tokens, in /secrets (none are in the image; make
# them once, readable by the image's user 65532):
#   mkdir -p secrets
#   printf '/key/swarm/psk/1.0.0/\n/base16/\n%s\n' "$(openssl rand -hex 32)" > secrets/swarm.key
#   printf 'admin %s\ndecide %s\n' "$(openssl rand -hex 32)" "$(openssl rand -hex 32)" > secrets/tokens
#   sudo chown -R 65532:65532 secrets && sudo chmod 0400 secrets/*
#   docker run -v "$PWD/secrets:/secrets:ro" -p 8080:8080 ratemesh
# then call it with  -H "Authorization: Bearer <a token of secrets/tokens>".
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/ratemesh ./cmd/ratemesh \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ratemesh /usr/local/bin/ratemesh
COPY --from=build --chown=nonroot:nonroot /out/data /data
USER nonroot:nonroot
# 8080: HTTP API, 8081: Envoy's rate limit service (gRPC), 4001: the mesh (libp2p)
EXPOSE 8080 8081 4001
ENTRYPOINT ["/usr/local/bin/ratemesh"]
CMD ["serve", "--api", "0.0.0.0:8080", "--grpc", "0.0.0.0:8081", "--listen", "/ip4/0.0.0.0/tcp/4001", "--data-dir", "/data", \
     "--psk-file", "/secrets/swarm.key", "--token-file", "/secrets/tokens", "--log-format", "json"]
