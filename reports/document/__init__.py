"""The report's document model and the folder and files a build writes."""
