-- dpproxy's two backend roles, created when the postgres container initializes its data.
-- Their grants (and the Adult demo table) come from `dpproxy provision --load-demo` (the
-- `provision` service). Change the passwords here and in docker/config.yaml together.
CREATE ROLE dpproxy_reader LOGIN PASSWORD 'reader-secret';
CREATE ROLE dpproxy_passthrough LOGIN PASSWORD 'passthrough-secret';
