# Images of the project: docker build --target server -t etcdbackup-server .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version.Version=${VERSION}" -o /out/ ./cmd/etcdbackup-server

FROM gcr.io/distroless/static-debian12:nonroot AS server
COPY --from=build /out/etcdbackup-server /etcdbackup-server
USER 65532:65532
ENTRYPOINT ["/etcdbackup-server"]
