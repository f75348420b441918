# ratemesh: a static binary on a distroless base, run as non-root.
#   docker build --build-arg VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse HEAD) -t ratemesh .
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
CMD ["serve", "--api", "0.0.0.0:8080", "--grpc", "0.0.0.0:8081", "--listen", "/ip4/0.0.0.0/tcp/4001", "--data-dir", "/data", "--log-format", "json"]
