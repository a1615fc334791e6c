-- dpproxy's reader role, created when the postgres container initializes its data, with the
-- password docker/config.yaml's backend.dsn uses (change both together). Everything else (the
-- analyst database `demo`, the analysts' roles and their passwords, the grants, the Adult demo
-- table) comes from `dpproxy provision --load-demo` (the `provision` service).
CREATE ROLE dpproxy_reader LOGIN PASSWORD 'reader-secret';
