"""The autoscaler of `tandem up`: the local processes scraped and resized in a thread."""
