# The surge binary for server deployments (Kafka, Redis and ClickHouse are
# servers; chDB is not linked in).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/surge ./cmd/surge

FROM debian:bookworm-slim
COPY --from=build /out/surge /usr/local/bin/surge
# The services' local state (Pebble stores, number packages) lives here: a
# volume mounted on it starts owned by the image's user.
RUN mkdir -p /var/lib/surge && chown 65534:65534 /var/lib/surge
VOLUME /var/lib/surge
USER 65534
# Ready: joined its groups, its brokers and Redis answer (/readyz on
# metrics.addr, which the compose file sets to 0.0.0.0:9464).
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=6 CMD ["surge", "probe"]
ENTRYPOINT ["surge"]
