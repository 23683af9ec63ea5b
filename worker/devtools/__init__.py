"""Developer tools: `tandem model create-tiny` and `tandem generate`."""
