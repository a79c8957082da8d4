package demo

// forecast is one row of Bob's weather dataset.
type forecast struct {
	Location      string
	Date          string
	Temperature   float64 // degrees C
	Precipitation float64 // mm
	Condition     string  // sunny, cloudy, rainy or snowy
}

// dataset is the small weather dataset Bob's tool reads: five cities, one
// week. The numbers are made up.
var dataset = []forecast{
	{"Paris", "2024-10-14", 11.0, 0.0, "sunny"},
	{"Paris", "2024-10-15", 7.5, 3.2, "rainy"},
	{"Paris", "2024-10-16", 12.0, 0.0, "cloudy"},
	{"Paris", "2024-10-17", 8.5, 0.0, "sunny"},
	{"Paris", "2024-10-18", 4.0, 0.9, "cloudy"},
	{"Paris", "2024-10-19", 9.5, 0.0, "sunny"},
	{"Paris", "2024-10-20", 5.0, 7.2, "rainy"},
	{"London", "2024-10-14", 7.5, 0.8, "rainy"},
	{"London", "2024-10-15", 12.0, 0.0, "sunny"},
	{"London", "2024-10-16", 8.5, 9.6, "rainy"},
	{"London", "2024-10-17", 13.0, 0.3, "cloudy"},
	{"London", "2024-10-18", 9.5, 0.0, "sunny"},
	{"London", "2024-10-19", 14.0, 0.0, "cloudy"},
	{"London", "2024-10-20", 10.5, 0.0, "sunny"},
	{"Rome", "2024-10-14", 12.0, 0.0, "sunny"},
	{"Rome", "2024-10-15", 17.5, 7.2, "rainy"},
	{"Rome", "2024-10-16", 13.0, 0.9, "cloudy"},
	{"Rome", "2024-10-17", 18.5, 5.6, "rainy"},
	{"Rome", "2024-10-18", 14.0, 0.6, "cloudy"},
	{"Rome", "2024-10-19", 10.5, 0.0, "sunny"},
	{"Rome", "2024-10-20", 15.0, 0.8, "rainy"},
	{"Berlin", "2024-10-14", 17.5, 0.0, "cloudy"},
	{"Berlin", "2024-10-15", 13.0, 0.0, "sunny"},
	{"Berlin", "2024-10-16", 18.5, 3.2, "rainy"},
	{"Berlin", "2024-10-17", 14.0, 0.0, "cloudy"},
	{"Berlin", "2024-10-18", 19.5, 0.0, "sunny"},
	{"Berlin", "2024-10-19", 15.0, 0.9, "cloudy"},
	{"Berlin", "2024-10-20", 20.5, 0.0, "sunny"},
	{"Madrid", "2024-10-14", 22.0, 0.0, "sunny"},
	{"Madrid", "2024-10-15", 18.5, 0.8, "rainy"},
	{"Madrid", "2024-10-16", 23.0, 0.0, "sunny"},
	{"Madrid", "2024-10-17", 19.5, 9.6, "rainy"},
	{"Madrid", "2024-10-18", 24.0, 0.3, "cloudy"},
	{"Madrid", "2024-10-19", 20.5, 0.0, "sunny"},
	{"Madrid", "2024-10-20", 16.0, 0.0, "cloudy"}}
