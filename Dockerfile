# A static gitcanary on a distroless base: docker build -t gitcanary .
FROM rust:1.95-alpine3.22 AS build
# musl toolchain, libgit2's and aws-lc's build tools, OpenSSL to link statically.
RUN apk add --no-cache musl-dev cmake make perl pkgconf openssl-dev openssl-libs-static
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
ENV OPENSSL_STATIC=1
RUN cargo build --release --locked --bin gitcanary \
    && strip target/release/gitcanary

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/release/gitcanary /usr/local/bin/gitcanary
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gitcanary"]
CMD ["run", "--listen=0.0.0.0:8080"]
