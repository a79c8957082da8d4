module github.com/parleyhq/parley/sdk

go 1.26.0
