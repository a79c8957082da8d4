module github.com/parleyhq/parley/bench

go 1.26.0
