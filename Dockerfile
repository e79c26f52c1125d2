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
USER 65534
ENTRYPOINT ["surge"]
