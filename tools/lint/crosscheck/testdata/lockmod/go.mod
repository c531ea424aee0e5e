module example.test/lockmod

go 1.26.0
